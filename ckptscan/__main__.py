from ckptscan.console import main

main()
