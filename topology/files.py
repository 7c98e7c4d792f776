"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

import json
import os
import tempfile


def write_text_atomically(path, text):
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomically(path, data):
    """``data`` as indented JSON, written atomically."""
    write_text_atomically(path, json.dumps(data, indent=1) + "\n")
