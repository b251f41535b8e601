"""Virtual phones: a device-side adb daemon (adbd.py) that the real adb server connects to, each
phone with its own RAM limit (a memory cgroup), folder, getprop, logcat, meminfo and thermal files.
Start and stop them with manager.up()/down() or `bmoe-fleet virtual up|down|list`."""
