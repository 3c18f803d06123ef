"""day0.runtime: load a compiled artifact and generate with it."""


def __getattr__(name):  # `from day0.runtime import Session` without importing IREE on package import
    if name == "Session":
        from day0.runtime.session import Session

        return Session
    raise AttributeError(name)
