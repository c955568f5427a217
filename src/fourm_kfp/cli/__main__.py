"""``python -m fourm_kfp.cli``: the ``fourm-kfp`` command, as ``torchrun -m fourm_kfp.cli stage ...`` starts it in
every worker."""

import sys

from fourm_kfp.cli import main

if __name__ == "__main__":
    sys.exit(main())
