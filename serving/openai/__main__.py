"""``python -m serving.openai ...`` is ``python -m serving openai ...``."""

import sys

from serving.openai.cli import main

sys.exit(main())
