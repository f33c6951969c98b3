from resource_worker.main import main

main()
