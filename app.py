"""`python app.py`: the MTMC Kernel Agent chat on 127.0.0.1:7860.

Host and port follow Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, or --host / --port.
MTMC_AUTH="user:pass" turns on login; MTMC_MAX_STEPS and MTMC_TARGET set the run defaults;
MTMC_LLM_BASE_URL, MTMC_LLM_MODEL (and MTMC_LLM_API_KEY) preset the LLM that writes why-answers.
"""
from __future__ import annotations

import argparse
import os


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="MTMC Kernel Agent: the chat app")
    p.add_argument("--host", default=None, help="interface to listen on (default: $GRADIO_SERVER_NAME or 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default: $GRADIO_SERVER_PORT or 7860)")
    p.add_argument("--max-steps", type=int, default=None, help="planner steps per run (default: $MTMC_MAX_STEPS or 8)")
    p.add_argument("--target", default=None, help="GPU profile: auto, h200, h100, a100, v100")
    args = p.parse_args(argv)
    for env, value in (("MTMC_MAX_STEPS", args.max_steps), ("MTMC_TARGET", args.target)):
        if value is not None:
            os.environ[env] = str(value)

    from mtmc.tools.isolation import status
    from mtmc.ui.layout import build_app, launch_options
    from mtmc.ui.settings import auth_from_env
    print(status().line(), flush=True)   # uploads run only in an OS-level sandbox, or not at all
    options = launch_options(auth_from_env())
    build_app().queue().launch(server_name=args.host, server_port=args.port, **options)


if __name__ == "__main__":
    main()
