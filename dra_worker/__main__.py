from dra_worker.main import main

main()
