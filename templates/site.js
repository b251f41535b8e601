/* Draws every chart of a page from the JSON block its div names, with the plotly.min.js that the
   site carries in assets/ (no network). When all are drawn, <body data-charts="N"> says so. */
(function () {
  "use strict";
  function draw(el) {
    var block = document.getElementById(el.getAttribute("data-figure"));
    var figure = JSON.parse(block.textContent);
    return Plotly.newPlot(el, figure.data, figure.layout, { displayModeBar: false, responsive: true })
      .then(function () { el.setAttribute("data-rendered", "1"); });
  }
  function drawAll() {
    var charts = document.querySelectorAll(".chart[data-figure]");
    var pending = [];
    for (var i = 0; i < charts.length; i++) { pending.push(draw(charts[i])); }
    Promise.all(pending).then(function () {
      document.body.setAttribute("data-charts", String(charts.length));
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", drawAll);
  } else {
    drawAll();
  }
})();
