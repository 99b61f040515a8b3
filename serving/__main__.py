"""``python -m serving serve --model-repository build/model_repository``: run tritonserver in the foreground."""

import sys

from serving.launcher import main

sys.exit(main())
