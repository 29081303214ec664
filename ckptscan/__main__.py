from ckptscan.cli import main

main()
