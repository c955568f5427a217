"""Run the fourm-kfp CLI as on a CPU without bf16 arithmetic: `precision: auto` then trains and generates in fp32.

.venv/bin/python experiments/2026-11-26-demo-val256/fp32only.py stage pretrain --preset demo --root runs/demo-fp32
(any fourm-kfp arguments)"""
import sys

import fourm_kfp.hardware as hw

hw.cpu_has_native_bf16 = lambda: False  # before the CLI imports anything that reads it
from fourm_kfp.cli import main  # noqa: E402

sys.exit(main())
