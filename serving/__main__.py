"""``python -m serving serve --model-repository build/model_repository``: run tritonserver in the foreground.
``python -m serving openai --triton localhost:8001``: the OpenAI-compatible front door (serving/openai)."""

import sys

if sys.argv[1:2] == ["openai"]:
    from serving.openai.cli import main as openai_main

    sys.exit(openai_main(sys.argv[2:]))

from serving.launcher import main

sys.exit(main())
