"""Atomic file writes (text, JSON, pictures): a reader sees the old file or the new one, never half of one.

The new file gets the mode an ordinary ``open()`` would give it (0666 less the umask), not
the 0600 of a temporary file.
"""

import json
import os
import tempfile


def current_umask():
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path, write, binary=False):
    """Call ``write(f)`` on a temporary file in ``path``'s folder, then rename it over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomically(path, text):
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename."""
    write_atomically(path, lambda f: f.write(text))


def check_writable(path):
    """Raise ``OSError`` unless a file can be written atomically at ``path`` (its folder made,
    a temporary file created there and removed), before the work that would fill it."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(21, "it is a folder", path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    os.close(fd)
    os.unlink(tmp)


def cannot_write(path, exc):
    """One line saying why ``path`` cannot be written (``exc`` the ``OSError``)."""
    if isinstance(exc, (FileExistsError, NotADirectoryError)):
        reason = "part of its folder is a file"
    else:
        reason = exc.strerror or str(exc)
    return f"{path}: cannot write there: {reason}"


def write_json_atomically(path, data):
    """``data`` as indented JSON, written atomically."""
    write_text_atomically(path, json.dumps(data, indent=1) + "\n")


def save_figure_atomically(fig, path, **savefig):
    """A matplotlib figure as a PNG at ``path``, written atomically (``savefig`` passed on)."""
    write_atomically(path, lambda f: fig.savefig(f, format="png", **savefig), binary=True)
