from knobkeeper.cli import main

main()
