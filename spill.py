import sys, time, shutil, threading, os
from pathlib import Path
from labels_party import labelstore
from labels_party.storage import DataStore
from shared.domains import domain_from_spec
D = domain_from_spec({"kind": "integer", "min": 0, "max": 60})
mem = int(sys.argv[3])
root = Path("/tmp/upl/data"); shutil.rmtree(root, ignore_errors=True)
store = DataStore(root)
seen = {"max": 0}
def watch():
    while True:
        total = 0
        for d in (root / "tmp").glob("duckdb-*"):
            for f in d.rglob("*"):
                try: total += f.stat().st_size
                except OSError: pass
        seen["max"] = max(seen["max"], total); time.sleep(0.005)
threading.Thread(target=watch, daemon=True).start()
t = time.time()
a = labelstore.ingest(store, "d", 1, Path(sys.argv[1]), "parquet", D, None, [], 0, memory_mb=mem)
print("first", round(time.time()-t, 1), "spilled max", seen["max"] >> 20, "MB"); seen["max"] = 0; t = time.time()
b = labelstore.ingest(store, "d", 2, Path(sys.argv[2]), "parquet", D, None, [labelstore.RegistryPart(a.file, 0, a.registry_end)], a.registry_end, memory_mb=mem)
print("second", round(time.time()-t, 1), b.new_examples, "spilled max", seen["max"] >> 20, "MB")
