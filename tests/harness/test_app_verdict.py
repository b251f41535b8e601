"""The app's verdict (harness.run.app_verdict): lmkd's decision replayed over a run's samples with the
engine counted as a registered app, and the lmkd inputs it reads (devices.lmkd_inputs)."""

from __future__ import annotations

from devices.lmkd_inputs import LmkdSample, parse_props, parse_sample, parse_setting, parse_zoneinfo
from devices.lmkd_policy import LmkProps, watermarks
from harness.run.app_verdict import OtherApp, replay, verdicts

RAM_KB = 512 * 1024
MARKS = watermarks(RAM_KB)                     # min 2896, low 3620, high 4344 kB for 512 MiB
SETTING = parse_setting("", RAM_KB)            # nothing readable: lmkd's defaults, marks from RAM
SWAP_KB = 256 * 1024


def _sample(free_kb: int, swap_free_kb: int, psi_us: int | None = 0) -> LmkdSample:
    return LmkdSample(free_kb=free_kb, available_kb=free_kb, swap_total_kb=SWAP_KB, swap_free_kb=swap_free_kb,
                      file_lru_kb=10_000, workingset_refault_file=0, psi_full_total_us=psi_us)


def _run(*frees_and_swaps: tuple[int, int]) -> list[tuple[float, LmkdSample]]:
    return [(float(t), _sample(free, swap)) for t, (free, swap) in enumerate(frees_and_swaps)]


def test_marks_from_ram_when_nothing_was_readable():
    assert SETTING.marks == MARKS and SETTING.marks_from.startswith("computed from MemTotal")
    assert SETTING.props == LmkProps()


def test_plenty_of_free_memory_holds_in_either_role():
    run = _run((100_000, SWAP_KB), (90_000, SWAP_KB // 2), (80_000, SWAP_KB // 3))
    for v in verdicts(run, SETTING, []):
        assert not v.killed and v.at_s is None and v.samples == 3
        assert "holds at 600 MiB" in v.describe("600 MiB")


def test_low_watermark_and_low_swap_spare_a_perceptible_app_but_the_min_watermark_does_not():
    low_swap = SWAP_KB // 20                             # under ro.lmk.swap_free_low_percentage (10 %)
    between = (MARKS.min_kb + MARKS.low_kb) // 2         # under low, over min: min_score_adj 201
    run = _run((100_000, SWAP_KB), (between, low_swap), (between, low_swap), (MARKS.min_kb - 100, low_swap))
    top, service = verdicts(run, SETTING, [])
    # adj 0 and 200 are both under 201 until the min watermark breaks (lmkd: "Do not kill
    # perceptible apps unless below min watermark or heavily thrashing")
    assert top.killed and service.killed
    assert top.at_s == service.at_s == 3.0
    assert "min watermark is breached and swap is low" in top.reason
    assert "would kill the app at 600 MiB after 3.0 s (min watermark" in top.describe("600 MiB")


def test_other_registered_apps_go_first_and_the_app_only_when_none_is_left():
    low_swap = SWAP_KB // 20
    squeezed = (MARKS.min_kb - 100, low_swap)
    cached = OtherApp("com.example.cached", 905, 50_000)
    perceptible = OtherApp("com.example.music", 200, 60_000)
    top, service = verdicts(_run((100_000, SWAP_KB), squeezed, squeezed, squeezed, squeezed), SETTING,
                            [cached, perceptible])
    # wakeup 1 kills the cached app (905), wakeup 2 the perceptible one (200, which outranks the
    # app on top), wakeup 3 the app on top; as a foreground service (200) the app ties with the
    # perceptible app and the older of the two goes first (lmkd's per-adj LRU tail)
    assert (top.killed, top.at_s) == (True, 3.0)
    assert (service.killed, service.at_s) == (True, 3.0)


def test_an_app_the_real_lmkd_already_took_is_no_shield():
    low_swap = SWAP_KB // 20
    squeezed = (MARKS.min_kb - 100, low_swap)
    gone = OtherApp("com.example.cached", 905, 50_000, killed_at_s=0.5)
    (top, _) = verdicts(_run((100_000, SWAP_KB), squeezed), SETTING, [gone])
    assert (top.killed, top.at_s) == (True, 1.0)


def test_rules_without_their_inputs_are_named():
    run = [(0.0, LmkdSample(free_kb=100_000, swap_total_kb=SWAP_KB, swap_free_kb=SWAP_KB))]
    v = replay(run, SETTING, [], "service", 200)
    assert not v.killed
    assert any("memory PSI refused" in u for u in v.unevaluated)
    assert any("thrashing" in u for u in v.unevaluated)
    assert "not evaluated: device is not responding (memory PSI refused)" in v.describe("300 MiB")


def test_samples_without_memory_are_not_replayed():
    v = replay([(0.0, LmkdSample())], SETTING, [], "top", 0)
    assert v.samples == 0 and "not replayed" in v.describe("1 MiB")


# /proc/zoneinfo as mm/vmstat.c zoneinfo_show_print writes it (two zones, one not present)
ZONEINFO = """Node 0, zone      DMA
  per-node stats
      nr_inactive_anon 130330
  pages free     3840
        boost    0
        min      30
        low      37
        high     44
        promo    51
        spanned  4095
        present  3998
        managed  3840
        cma      0
        protection: (0, 3018, 8394, 8394, 8394)
      nr_free_pages 3840
  pagesets
    cpu: 0
              count:    0
              high:     0
Node 0, zone   Normal
  pages free     1000
        boost    0
        min      6065
        low      7581
        high     9097
        spanned  1044480
        present  782336
        managed  772845
        protection: (0, 0, 5376, 5376, 5376)
Node 0, zone  Movable
  pages free     0
        min      0
        low      0
        high     0
        spanned  0
        present  0
        managed  0
        protection: (0, 0, 0, 0, 0)
"""


def test_zoneinfo_watermarks_are_lmkds_sums_with_each_zones_largest_protection():
    marks = parse_zoneinfo(ZONEINFO, 4096)
    assert marks is not None
    assert marks.min_kb == ((30 + 8394) + (6065 + 5376)) * 4
    assert marks.low_kb == ((37 + 8394) + (7581 + 5376)) * 4
    assert marks.high_kb == ((44 + 8394) + (9097 + 5376)) * 4
    assert parse_zoneinfo(ZONEINFO, 16384).min_kb == marks.min_kb * 4    # a 16 KiB-page phone
    assert parse_zoneinfo("cat: /proc/zoneinfo: Permission denied\n", 4096) is None


def test_a_phone_run_read_parses_props_zoneinfo_and_page_size():
    text = ("[ro.lmk.kill_heaviest_task]: [true]\n[ro.lmk.swap_free_low_percentage]: [20]\n"
            "[ro.lmk.thrashing_limit]: [thirty]\n[ro.lmk.not_a_prop]: [1]\n"
            "@@LMKDZONEINFO\n" + ZONEINFO + "@@LMKDPAGESIZE\n16384\n")
    setting = parse_setting(text, RAM_KB)
    assert setting.props.kill_heaviest_task is True and setting.props.swap_free_low_percentage == 20
    assert setting.props.thrashing_limit == LmkProps().thrashing_limit      # unparseable: lmkd's default
    assert setting.props_set == ("ro.lmk.kill_heaviest_task", "ro.lmk.swap_free_low_percentage")
    assert setting.marks_from == "zoneinfo" and setting.marks.min_kb == ((30 + 8394) + (6065 + 5376)) * 16
    props, seen = parse_props("[ro.lmk.use_psi]: [false]\n[ro.lmk.psi_complete_stall_ms]: [700]\n")
    assert props.use_psi is False and seen == ("ro.lmk.psi_complete_stall_ms", "ro.lmk.use_psi")


def test_a_sample_reads_meminfo_refaults_and_psi_and_refuses_foreign_digits():
    meminfo = {"MemFree": 5000, "MemAvailable": 9000, "SwapTotal": 100, "SwapFree": 50,
               "Active(file)": 700, "Inactive(file)": 300}
    vmstat = "workingset_refault_anon 12\nworkingset_refault_file 34\npswpin 1\n"
    psi = "some avg10=0.00 avg60=0.00 avg300=0.00 total=77\nfull avg10=1.50 avg60=0.20 avg300=0.01 total=99\n"
    s = parse_sample(meminfo, vmstat, psi)
    assert (s.free_kb, s.available_kb, s.swap_total_kb, s.swap_free_kb, s.file_lru_kb) == (5000, 9000, 100, 50, 1000)
    assert (s.workingset_refault_file, s.psi_full_total_us) == (34, 99)
    old = parse_sample({}, "workingset_refault 8\n", "")
    assert old.workingset_refault_file == 8 and old.psi_full_total_us is None and old.reading(0.0) is None
    assert parse_sample({}, "workingset_refault_file ١٢\n", "full avg10=0 avg60=0 avg300=0 total=٣").workingset_refault_file is None


def test_a_kernel_kill_over_adb_is_lmkds_kill_of_the_app_on_a_phone_with_swap():
    # samples a second apart that all came before the squeeze, then the kernel's OOM kill at 2.5 s
    calm = _run((100_000, SWAP_KB), (90_000, SWAP_KB))
    top, service = verdicts(calm, SETTING, [], kernel_killed_at_s=2.5)
    assert (top.killed, top.at_s, service.killed) == (True, 2.5, True)
    assert "min watermark is breached and swap is low (0kB <" in top.reason
    # a cached app still registered goes first: the app is killed only at a later wakeup
    (shielded, _) = verdicts(calm, SETTING, [OtherApp("com.example.cached", 905, 50_000)], kernel_killed_at_s=2.5)
    assert not shielded.killed
    # no sample said the swap: the phone's own size stands in; a phone without swap has no such rule
    assert verdicts([], SETTING, [], kernel_killed_at_s=1.0, swap_total_kb=SWAP_KB)[0].killed
    no_swap = [(0.0, LmkdSample(free_kb=100_000, available_kb=100_000, swap_total_kb=0, swap_free_kb=0))]
    assert not verdicts(no_swap, SETTING, [], kernel_killed_at_s=1.0)[0].killed


def test_a_kill_the_real_lmkd_made_is_a_wakeup_the_samples_missed():
    # calm samples a second apart; between them lmkd killed the app in front (adj 0) at 0.5 s
    calm = _run((100_000, SWAP_KB), (100_000, SWAP_KB))
    front = OtherApp("com.example.chat", 0, 30_000, killed_at_s=0.5,
                     reason="min watermark is breached and swap is low (100kB < 6553kB)")
    top, service = verdicts(calm, SETTING, [front])
    # that wakeup's min_score_adj was at most 0: as a foreground service (200) the app goes first;
    # on top (0) it ties with the app lmkd took, the older of the two, which goes instead
    assert (service.killed, service.at_s) == (True, 0.5)
    assert service.reason == "as lmkd did when it killed com.example.chat: min watermark is breached and swap is low (100kB < 6553kB)"
    assert not top.killed
    # a cached app's kill says only that min_score_adj was at most 905: no verdict on adj 0 or 200
    cached = OtherApp("com.example.cached", 905, 30_000, killed_at_s=0.5)
    assert not any(v.killed for v in verdicts(calm, SETTING, [cached]))
