from anatomy_cli.cli.main import main

main()
