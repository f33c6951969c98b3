from kubelet_watchdog.main import main

main()
