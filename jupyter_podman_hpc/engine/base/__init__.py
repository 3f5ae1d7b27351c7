"""What every room of the engine stands on; it imports only the engine's leaves.

- ``commands``: the runner of every external command, which logs each at debug level
- ``files``: the one atomic write-temp-then-rename; files a container could have written, read as data
  (bounded, no link followed, never blocking on a FIFO)
- ``locks``: an exclusive file lock across processes and threads (flock; containers/storage's lockf)
- ``private``: per-user state directories, made 0700 and verified before each use; why a path is closed to the user
- ``processes``: what the engine asks about a process (psutil)
- ``space``: how much room a file system has left (what tells a full disk from another failed write)
"""
