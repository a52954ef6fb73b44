"""Build the native core with the package: the Rust crate through
setuptools-rust and the Cython modules through cythonize, in one install."""

from Cython.Build import cythonize
from setuptools import Extension, find_namespace_packages, setup
from setuptools_rust import Binding, RustExtension

setup(
    # The load generator's folder is loadgen/, its import name
    # pysched_loadgen: the mapping installs the one as the other, and no
    # top-level `loadgen` module ships. pyproject.toml's packages.find would
    # name it by its folder, hence the list here; pysched's packages are found
    # as that did (namespace folders included, like api/ui/static).
    packages=[*find_namespace_packages(include=["pysched", "pysched.*"]), "pysched_loadgen"],
    package_dir={"pysched_loadgen": "loadgen"},
    rust_extensions=[
        RustExtension(
            "pysched._native",
            path="rust/py/Cargo.toml",
            binding=Binding.PyO3,
            # The wheel is on the hot path even in editable installs.
            debug=False,
        )
    ],
    ext_modules=cythonize(
        [
            Extension("pysched._codec", ["core_ext/codec.pyx"]),
            Extension("pysched._loader", ["core_ext/loader.pyx"]),
        ],
        compiler_directives={"language_level": "3"},
    ),
    zip_safe=False,
)
