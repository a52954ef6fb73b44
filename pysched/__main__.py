from pysched.cli import main

main()
