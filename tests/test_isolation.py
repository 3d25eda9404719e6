"""tests/conftest.py's guard: a test that leaks process-wide state fails, and the next test starts clean."""
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

LEAKY = '''
import os, sys, torch

def test_leaks_the_default_dtype():
    torch.set_default_dtype(torch.float64)

def test_leaks_an_environment_variable_and_the_working_directory(tmp_path):
    os.environ["FLEXSN_DSL_LEAK"] = "1"
    os.chdir(tmp_path)

def test_leaks_sys_path_and_grad_mode():
    sys.path.insert(0, "/nonexistent/leak")
    torch.set_grad_enabled(False)

def test_restores_what_it_changes(monkeypatch):
    monkeypatch.setenv("FLEXSN_DSL_LEAK", "2")
    with torch.device("cpu"):
        torch.zeros(1)

def test_the_next_test_starts_clean():
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    assert "FLEXSN_DSL_LEAK" not in os.environ and "/nonexistent/leak" not in sys.path
    assert os.getcwd() == os.environ["LEAK_TEST_CWD"]
'''


def test_a_leak_fails_the_test_that_leaked_and_is_undone(tmp_path):
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_leaks.py").write_text(LEAKY)
    env = dict(os.environ, LEAK_TEST_CWD=str(tmp_path), PYTHONPATH=os.pathsep.join([str(TESTS.parent),
                                                                                      os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rE", "test_leaks.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout
    assert "5 passed, 3 errors" in out, out
    assert "leaked global state: default dtype (torch.float32 -> torch.float64)" in out
    assert "leaked global state: environment (FLEXSN_DSL_LEAK); working directory" in out
    assert "leaked global state: grad mode (True -> False); sys.path" in out
