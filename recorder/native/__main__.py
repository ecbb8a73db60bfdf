"""``python -m recorder.native``: build (if need be) and check the native recorder; one line
out, exit status 0 when it loads, 1 when it does not."""

from __future__ import annotations

import sys

from recorder.native.build import NativeRecorderError, load


def main() -> int:
    try:
        ext, reason = load()
    except NativeRecorderError as exc:
        print(f"ckview: {exc}", file=sys.stderr)
        return 1
    if ext is None:
        print(f"ckview: the native recorder is not available: {reason}", file=sys.stderr)
        return 1
    print(f"ckview: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
