"""`python -m scripts.bench`: the same benchmark as `gpt-oss-server bench` (server/bench/)."""

from server.bench.__main__ import main

if __name__ == "__main__":
    main()
