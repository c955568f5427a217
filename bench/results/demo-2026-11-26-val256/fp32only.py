"""Run the fourm-kfp CLI as on a CPU without bf16 arithmetic: `precision: auto` then trains and generates in fp32.
import sys
import fourm_kfp.hardware as hw
hw.cpu_has_native_bf16 = lambda: False
from fourm_kfp.cli import main
sys.exit(main())
