from tidings.cli import main

main()
