"""`python -m kubelet_watchdog`: the kubelet watchdog process."""

from kubelet_watchdog.main import main

main()
