from pysched.sim.cli import app

app(prog_name="pysched-sim")
