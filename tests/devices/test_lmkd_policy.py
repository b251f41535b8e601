"""Android 14 lmkd's decision (devices/lmkd_policy.py) on recorded meminfo/vmstat values of
a 512 MiB phone with 128 MiB of zram: silent while swap is free, low-swap and thrashing kills with
lmkd's own reason texts, victims by oom_score_adj."""

from devices import lmkd_policy as lp
from devices.android import PERCEPTIBLE_APP_ADJ
from devices.lmk import KILL_REASONS, parse_line

RAM_KB = 512 * 1024
ZRAM_KB = 128 * 1024


def policy(**props) -> lp.Policy:
    return lp.Policy(lp.LmkProps(**props), lp.watermarks(RAM_KB))


def test_watermarks_follow_the_kernels_min_free_kbytes():
    w = lp.watermarks(RAM_KB)
    assert w.min_kb == 2896                       # sqrt(16 * 524288)
    assert (w.low_kb, w.high_kb) == (2896 + 724, 2896 + 2 * 724)
    assert lp.watermarks(16 << 20).min_kb == 16384   # a 16 GiB phone: sqrt(16 * 16 GiB in kB)


def test_silent_while_swap_is_free_even_with_memory_full():
    p = policy()
    for swap_free in (ZRAM_KB, ZRAM_KB // 2, ZRAM_KB * 11 // 100):   # swapping, > 10 % free
        assert p.decide(lp.Reading(free_kb=100, swap_total_kb=ZRAM_KB, swap_free_kb=swap_free)) is None


def test_low_swap_with_watermark_breached_kills_with_lmkds_reason():
    d = policy().decide(lp.Reading(free_kb=1000, swap_total_kb=ZRAM_KB, swap_free_kb=4000))
    assert d is not None and d.reason == lp.LOW_MEM_AND_SWAP
    assert d.text == f"min watermark is breached and swap is low (4000kB < {ZRAM_KB // 10}kB)"
    assert d.min_score_adj == 0                   # below min: even the foreground may go
    assert KILL_REASONS[d.reason] == "low mem and swap"
    low = policy().decide(lp.Reading(free_kb=3000, swap_total_kb=ZRAM_KB, swap_free_kb=4000))
    assert low is not None and low.text.startswith("low watermark is breached")
    assert low.min_score_adj == PERCEPTIBLE_APP_ADJ + 1   # perceptible apps are spared above min


def test_low_swap_is_not_a_kill_while_free_memory_is_above_high():
    assert policy().decide(lp.Reading(free_kb=50_000, swap_total_kb=ZRAM_KB, swap_free_kb=0)) is None


def test_no_swap_at_all_is_never_low_swap():
    assert policy().decide(lp.Reading(free_kb=10, swap_total_kb=0, swap_free_kb=0)) is None


def test_thrashing_kill_and_its_limit_decays():
    p = policy()
    base = dict(free_kb=1000, swap_total_kb=ZRAM_KB, swap_free_kb=ZRAM_KB, file_lru_kb=40_000)
    assert p.decide(lp.Reading(workingset_refault_file=0, **base)) is None       # the cycle starts
    d = p.decide(lp.Reading(workingset_refault_file=10_001 + 1000, **base))     # > 100 % of the LRU
    assert d is not None and d.reason == lp.LOW_MEM_AND_THRASHING
    assert d.text.startswith("min watermark is breached and thrashing (")
    assert d.min_score_adj == PERCEPTIBLE_APP_ADJ
    assert p.thrashing_limit == 90                # cut by thrashing_limit_decay (10 %)
    swap_low = policy()
    swap_low.decide(lp.Reading(workingset_refault_file=0, **{**base, "swap_free_kb": 10}))
    d2 = swap_low.decide(lp.Reading(workingset_refault_file=20_000, **{**base, "swap_free_kb": 10}))
    assert d2 is not None and d2.reason == lp.LOW_SWAP_AND_THRASHING
    assert d2.text.startswith(f"device is low on swap (10kB < {ZRAM_KB // 10}kB) and thrashing (")


def test_critical_pressure_and_pressure_after_kill():
    p = policy()
    r = dict(free_kb=1000, swap_total_kb=ZRAM_KB, swap_free_kb=ZRAM_KB)
    assert p.decide(lp.Reading(psi_full_total_us=0, now_s=0.0, **r)) is None
    d = p.decide(lp.Reading(psi_full_total_us=800_000, now_s=0.5, **r))          # 800 ms stalled in 0.5 s
    assert d is not None and (d.reason, d.text) == (lp.NOT_RESPONDING, "device is not responding")
    p.killed()
    after = p.decide(lp.Reading(psi_full_total_us=800_000, now_s=0.6, **r))
    assert after is not None and after.text == "min watermark is breached even after kill"


def test_victims_highest_adj_first_then_oldest_or_heaviest():
    procs = [lp.Candidate(1, 0, 500_000, 1.0), lp.Candidate(2, 900, 10_000, 3.0),
             lp.Candidate(3, 900, 90_000, 4.0), lp.Candidate(4, 200, 50_000, 0.5)]
    assert lp.choose_victim(procs, 0, heaviest=False).pid == 2
    assert lp.choose_victim(procs, 0, heaviest=True).pid == 3
    assert lp.choose_victim(procs[:1] + procs[3:], 201, heaviest=False) is None
    assert lp.choose_victim([procs[0], procs[3]], 0, heaviest=False).pid == 4
    # at PERCEPTIBLE_APP_ADJ and under lmkd takes the heaviest, whatever kill_heaviest_task says
    # (lmkd.cpp find_and_kill_process, Android 12+): the younger, heavier perceptible app
    perceptible = [procs[3], lp.Candidate(5, 200, 90_000, 2.0)]
    assert lp.choose_victim(perceptible, 0, heaviest=False).pid == 5
    assert lp.choose_victim([procs[0], lp.Candidate(6, 0, 90_000, 0.1)], 0, heaviest=False).pid == 1


def test_props_as_getprop_shows_them():
    props = lp.LmkProps().props()
    assert props["ro.lmk.swap_free_low_percentage"] == "10"
    assert props["ro.lmk.kill_heaviest_task"] == "false"
    assert props["ro.lmk.thrashing_limit_critical"] == "200"
    assert {"ro.lmk.psi_partial_stall_ms", "ro.lmk.psi_complete_stall_ms", "ro.lmk.critical_upgrade",
            "ro.lmk.thrashing_limit_decay"} <= props.keys()


def test_host_parser_reads_the_new_reason_texts():
    text = f"min watermark is breached and swap is low (4000kB < {ZRAM_KB // 10}kB)"
    e = parse_line(f"Kill 'com.bmoe.app.cached1' (42), uid 10100, oom_score_adj 900 to free 300000kB rss, "
                   f"1000kB swap; reason: {text}")
    assert e is not None and (e.oom_score_adj, e.uid, e.reason) == (900, 10100, text)


def test_polls_fast_while_swap_is_low_or_after_a_kill():
    p = policy()
    p.decide(lp.Reading(free_kb=100_000, swap_total_kb=ZRAM_KB, swap_free_kb=ZRAM_KB))
    assert p.poll_interval_s == lp.POLL_LONG_S == 0.1
    p.decide(lp.Reading(free_kb=100_000, swap_total_kb=ZRAM_KB, swap_free_kb=10))
    assert p.poll_interval_s == lp.POLL_SHORT_S == 0.01
    p.decide(lp.Reading(free_kb=100_000, swap_total_kb=ZRAM_KB, swap_free_kb=ZRAM_KB))
    p.killed()
    assert p.poll_interval_s == lp.POLL_SHORT_S
