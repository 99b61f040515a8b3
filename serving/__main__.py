"""``python -m serving serve --model-repository build/model_repository``: run tritonserver in the foreground.
``python -m serving openai --triton localhost:8001``: the OpenAI-compatible front door (serving/openai).
``python -m serving health --url localhost:8001``: the generating liveness check once (serving/health.py)."""

import sys

if sys.argv[1:2] == ["openai"]:
    from serving.openai.cli import main as openai_main

    sys.exit(openai_main(sys.argv[2:]))
if sys.argv[1:2] == ["health"]:
    from serving.health import main as health_main

    sys.exit(health_main(sys.argv[2:]))

from serving.launcher import main

sys.exit(main())
