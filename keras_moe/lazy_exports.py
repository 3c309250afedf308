"""Package attributes imported on first use (PEP 562), so importing a package is cheap.

`import keras_moe` then neither imports Keras nor its backend: a command-line
tool can import its own module first and start the backend later, with the
start-up noise filtered (`keras_moe.startup`), and a library user's process is
left as it was until a layer is asked for.

Example:
>>> __getattr__, __dir__ = lazy_exports("json", {"dumps": "json", "decoder": None})
>>> __getattr__("dumps")([1])
'[1]'
>>> __getattr__("decoder").__name__  # None: a submodule of the package
'json.decoder'
"""

import importlib


def lazy_exports(package, exports):
    """A module `__getattr__` and `__dir__` for `package`'s lazy `exports`.

    Args:
        package: the package's name (`__name__`).
        exports: `{attribute: module}`; the attribute is `module`'s attribute
            of that name, or (module None) the package's submodule of that name.

    Returns:
        `(__getattr__, __dir__)` to assign in the package's `__init__`.
    """
    package_module = importlib.import_module(package)

    def __getattr__(name):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = exports[name]
        if module is None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            value = getattr(importlib.import_module(module), name)
        setattr(package_module, name, value)  # later lookups skip __getattr__
        return value

    def __dir__():
        return sorted(set(vars(package_module)) | set(exports))

    return __getattr__, __dir__
