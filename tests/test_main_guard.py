"""build_map in a script without `if __name__ == "__main__":` (the first thing a new user writes):
one line that says what to add, before any worker process starts (shardkit/jobs/main_guard.py)."""
import os
import subprocess
import sys
import textwrap

from shardkit.jobs.main_guard import guarded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_guarded_reads_the_top_level_statement_that_holds_the_line():
    source = textwrap.dedent('''\
        import x
        x.run()
        def main():
            x.run()
        if __name__ == "__main__":
            main()
        if "__main__" == __name__:
            x.run()
        if __name__ == "__main__" or True:
            x.run()
        if __name__ != "__main__":
            x.run()
        ''')
    lines = {n: guarded(source, n) for n in range(1, 13)}
    assert lines[2] is False  # a bare call
    assert lines[6] is True and lines[8] is True  # under the guard, either order
    assert lines[10] is False and lines[12] is False  # a test that is not the guard
    assert guarded("def (:", 1) is True  # cannot parse: nothing to say
    more = textwrap.dedent('''\
        if __name__ == "__main__": main()
        if __name__ == "__main__" and ok:
            main()
        try:
            if __name__ == "__main__":
                main()
        except KeyError:
            pass
        if __name__ == "__main__":
            pass
        else:
            main()
        with context():
            main()
        ''')
    assert [guarded(more, n) for n in (1, 3, 6, 12, 14)] == [True, True, True, False, False]
    # the one-line guard; and-ed with another test; inside a top-level try; the guard's else; a with block


def run_script(tmp_path, body):
    script = tmp_path / "make.py"
    script.write_text(textwrap.dedent('''\
        from shardkit import build_map

        def fn(x):
            return {"__key__": f"k{x:04d}", "txt": f"text {x}"}

        ''') + textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)


def test_an_unguarded_script_is_told_what_to_add_before_any_worker_starts(tmp_path):
    proc = run_script(tmp_path, 'build_map(fn, list(range(10)), "out", workers=2, worker_pool="processes")\n')
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert "ConfigError" in last and "make.py, line 6" in last and 'if __name__ == "__main__":' in last
    for noise in ("Nanny", "FolderLocked", "forkserver"):
        assert noise not in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before OUT was made


def test_a_script_in_another_encoding_is_read_as_python_reads_it(tmp_path):
    script = tmp_path / "make.py"
    script.write_bytes(textwrap.dedent('''\
        # -*- coding: latin-1 -*-
        from shardkit import build_map
        # caf\xe9

        def fn(x):
            return {"__key__": f"k{x:04d}", "txt": f"text {x}"}

        build_map(fn, list(range(10)), "out", workers=2, worker_pool="processes")
        ''').encode("latin-1"))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "make.py, line 8" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]


def test_threads_and_in_process_runs_need_no_guard(tmp_path):
    proc = run_script(tmp_path, '''\
        build_map(fn, list(range(10)), "a", workers=0, progress=False)
        build_map(fn, list(range(10)), "b", workers=2, worker_pool="threads", progress=False)
        print("ok")
        ''')
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]
    assert (tmp_path / "a" / "manifest.json").exists() and (tmp_path / "b" / "manifest.json").exists()


def test_a_package_main_run_with_dash_m_is_not_imported_again(tmp_path):
    """python -m pkg runs pkg/__main__.py, which multiprocessing does not import again in a worker
    (as `python -m shardkit.cli build --map` does)."""
    pkg = tmp_path / "mk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(textwrap.dedent('''\
        from shardkit import build_map
        from mk.fns import fn
        build_map(fn, list(range(10)), "out", workers=2, worker_pool="processes", progress=False)
        print("ok")
        '''))
    (pkg / "fns.py").write_text('def fn(x):\n    return {"__key__": f"k{x:04d}", "txt": f"text {x}"}\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(tmp_path)])}
    proc = subprocess.run([sys.executable, "-m", "mk"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-2000:]


def test_build_at_the_top_level_of_a_script_is_told_too(tmp_path):
    """shardkit.build starts its cluster in a thread of its own: the statement judged is the one the
    main thread runs."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.jsonl").write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(20)))
    script = tmp_path / "make.py"
    script.write_text(textwrap.dedent('''\
        from shardkit import build
        from shardkit.config import BuildConfig

        build(BuildConfig("raw", "out", workers=2, worker_pool="processes", progress=False))
        '''))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "make.py, line 4" in last and 'if __name__ == "__main__":' in last, proc.stderr[-3000:]
    assert "Nanny" not in proc.stderr and not (tmp_path / "out" / "manifest.json").exists()
