from ckptscan.cli.console import main

main()
