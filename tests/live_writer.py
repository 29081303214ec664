"""A training job's checkpoint writer, as a separate process the tests drive.

    python tests/live_writer.py SOURCE_RUN TARGET_RUN

Reads one command a line on stdin and answers "ok" on stdout once it is done,
so a test knows exactly what is on disk when it looks. Paths are relative to
the two runs; bytes come from the source run (checkpoints made beforehand).

    copy REL            copy the file whole
    head REL N          write the file's first N bytes (a file being written)
    rest REL            append the rest of the file (the write completes)
    text REL WORDS      write WORDS as the file's whole content (pointer files)
    rename REL NEW      rename within the target run (HF Trainer's tmp-checkpoint-N → checkpoint-N)
    remove REL          delete a checkpoint directory (save_total_limit rotation)
"""

import shutil
import sys
from pathlib import Path


def main(source: Path, target: Path) -> None:
    for line in sys.stdin:
        command, rel, *args = line.split()
        src, dst = source / rel, target / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if command == "copy":
            dst.write_bytes(src.read_bytes())
        elif command == "head":
            dst.write_bytes(src.read_bytes()[: int(args[0])])
        elif command == "rest":
            with dst.open("ab") as f:
                f.write(src.read_bytes()[dst.stat().st_size:])
        elif command == "text":
            dst.write_text(" ".join(args))
        elif command == "rename":
            dst.rename(target / args[0])
        elif command == "remove":
            shutil.rmtree(dst)
        else:
            raise SystemExit(f"unknown command {command!r}")
        print("ok", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
