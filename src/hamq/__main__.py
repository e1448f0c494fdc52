from hamq.cli.main import main

main()
