from ferryctl.cli import main

main()
