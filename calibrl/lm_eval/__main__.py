"""``python -m calibrl.lm_eval TASK ... --out DIR``: calibrated task files for lm-eval (calibrl.lm_eval.main)."""

import sys

from calibrl.lm_eval import main

sys.exit(main())
