"""gpt-oss-server: a local OpenAI-compatible server for OpenAI's gpt-oss models."""

# llama.cpp's libraries load before anything else native. A build whose libraries carry their
# own static copy of libstdc++ (as a CUDA build on the first GPU machine did) crashes in its
# vocabulary load when the shared libstdc++ came first, e.g. with numpy: libstdc++'s unique
# symbols then bind to the shared copy's data. The package's first import fixes the order for
# every process that starts from `server` (docs/gpu.md, "The load-order crash"). An environment
# without llama.cpp (the test model's training one: devkit/train_tiny imports through `server`)
# has nothing to order; a llama.cpp that is installed but fails to load still fails here.
try:
    import llama_cpp.llama_cpp  # noqa: F401  (imported for its side effect: the load order)
except ModuleNotFoundError as missing:
    if missing.name != "llama_cpp":
        raise

__version__ = "0.1.0"
