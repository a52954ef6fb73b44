"""Build the native core with the package: the Rust crate through
setuptools-rust and the Cython modules through cythonize, in one install."""

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools_rust import Binding, RustExtension

setup(
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
