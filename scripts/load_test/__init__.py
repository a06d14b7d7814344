"""`python -m scripts.load_test`: the load test, which lives in server/bench/load/."""
