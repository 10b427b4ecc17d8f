"""What a server start would compile: a probe run in the server's interpreter (here,
or in the image) that imports app.root.main and prints, as JSON, the installed modules it
loaded from source without their .pyc (each compiled again at every start)."""

UNCOMPILED_MODULES = (
    "import json, os, sys, sysconfig; import app.root.main; "
    "site = sysconfig.get_paths()['purelib']; "
    "print(json.dumps(sorted(m.__name__ for m in list(sys.modules.values()) "
    "if (getattr(m, '__file__', None) or '').startswith(site) "
    "and m.__file__.endswith('.py') and not os.path.exists(m.__cached__))))"
)
