from scanner.main import main

main()
