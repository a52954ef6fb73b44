from pysched_loadgen.cli import main

main()
