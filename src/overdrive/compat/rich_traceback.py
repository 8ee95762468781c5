"""``accelerate.utils.rich``: importing it installs rich's tracebacks when rich is installed (Accelerate's
module then refuses to import; this one changes nothing, so that listing and importing every served path
works on any machine)."""

from overdrive.helpers.imports import is_rich_available

if is_rich_available():
    from rich.traceback import install

    install(show_locals=False)
