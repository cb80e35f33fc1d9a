"""Entry point of the Dataflow Flex Template (FLEX_TEMPLATE_PYTHON_PY_FILE).

The template launcher calls this file with the template parameters and the
Dataflow options (``--runner=DataflowRunner --project=... --region=...``).
It must submit the job and exit, not wait for it: ``--no_wait`` does that.
"""

import sys

from pipelines import continual_count

if __name__ == "__main__":
    continual_count.main(sys.argv[1:] + ["--no_wait"])
