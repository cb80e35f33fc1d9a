"""Example jobs of dp_beam, run from the repository root (``python -m pipelines.JOB``).

Not installed with the package: ``dp-beam`` finds them in ``./pipelines``.
Importing the package first hides, at the default verbosity, the warning Beam
logs on import when its ``gcp`` extra is absent (see
:func:`dp_beam.cli.hide_beam_import_noise`), since every job imports Beam
before it configures logging.
"""

from dp_beam.cli import hide_beam_import_noise

hide_beam_import_noise()
