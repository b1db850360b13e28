"""Minimal runner for toolgrid example tools (test helper, not used by toolgrid).

Runs a WASI preview 1 command module or a WASI preview 2 command component
(optionally with wasi:http) with the given argv and stdin, and returns
(exit_code, stdout, stderr).
Needs the Python bindings of wasmtime: pip install wasmtime
"""
import os
import tempfile

import wasmtime
from wasmtime import component as wc

_engine = wasmtime.Engine()
_cache = {}


def _load(path):
    if path not in _cache:
        with open(path, "rb") as f:
            data = f.read()
        # component binaries have layer 1 in the version field (bytes 6..8)
        is_component = data[4:8] != b"\x01\x00\x00\x00"
        if is_component:
            _cache[path] = (True, wc.Component(_engine, data))
        else:
            _cache[path] = (False, wasmtime.Module(_engine, data))
    return _cache[path]


def run(path, argv, stdin=b"", memory_limit=None, http=False):
    """memory_limit: maximum linear memory in bytes (like a ToolRelease's limits.memory).
    http: give a component wasmtime's wasi:http (outgoing requests go out for real)."""
    is_component, artifact = _load(path)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {n: os.path.join(tmp, n) for n in ("stdin", "stdout", "stderr")}
        with open(paths["stdin"], "wb") as f:
            f.write(stdin)
        wasi = wasmtime.WasiConfig()
        wasi.argv = list(argv)
        wasi.stdin_file = paths["stdin"]
        wasi.stdout_file = paths["stdout"]
        wasi.stderr_file = paths["stderr"]
        store = wasmtime.Store(_engine)
        store.set_wasi(wasi)
        if memory_limit is not None:
            store.set_limits(memory_size=memory_limit)
        code = 0
        if is_component:
            linker = wc.Linker(_engine)
            linker.add_wasip2()
            if http:
                store.set_wasi_http()
                linker.add_wasi_http()
            inst = linker.instantiate(store, artifact)
            iface = None
            for v in range(20, -1, -1):  # wasi:cli/run@0.2.x
                iface = inst.get_export_index(store, "wasi:cli/run@0.2.%d" % v)
                if iface is not None:
                    break
            assert iface is not None, "component does not export wasi:cli/run"
            func = inst.get_func(store, inst.get_export_index(store, "run", iface))
            try:
                res = func(store)  # result: Variant(tag='ok'|'err', payload=None)
                if getattr(res, "tag", "ok") != "ok":
                    code = 1
            except wasmtime.ExitTrap as e:
                code = e.code
        else:
            linker = wasmtime.Linker(_engine)
            linker.define_wasi()
            inst = linker.instantiate(store, artifact)
            try:
                inst.exports(store)["_start"](store)
            except wasmtime.ExitTrap as e:
                code = e.code
        out = {}
        for n in ("stdout", "stderr"):
            with open(paths[n], "rb") as f:
                out[n] = f.read()
        return code, out["stdout"], out["stderr"]
