"""shared/fence/loguru_asyncio.py: loguru without asyncio until a coroutine sink needs it, and loguru's own module
whenever it is not the one the stand-in was written against. Each case runs in a fresh interpreter, since
the stand-in only works before loguru is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _python(code: str, **env: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=60, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_the_installed_loguru_is_the_one_it_stands_in_for():
    # Fails when loguru is upgraded: read the new loguru/_asyncio_loop.py, then add its (length, CRC-32).
    assert _python("""
        from shared.fence import loguru_asyncio
        print(loguru_asyncio.install())
    """).split() == ["True"]


def test_loguru_logs_without_importing_asyncio():
    out = _python("""
        import io, sys
        from shared.fence import loguru_asyncio
        loguru_asyncio.install()
        from loguru import logger
        stream = io.StringIO()
        logger.remove()
        logger.add(stream, format="{message}")
        logger.info("plain record")
        print(stream.getvalue().strip(), "asyncio" in sys.modules, "ssl" in sys.modules)
    """)
    assert out.split() == ["plain", "record", "False", "False"]


def test_a_coroutine_sink_still_gets_every_record():
    # The only use loguru makes of the two functions: the running loop at add(), the task's loop at complete().
    out = _python("""
        import asyncio
        from shared.fence import loguru_asyncio
        assert loguru_asyncio.install()
        from loguru import logger
        received = []

        async def sink(message):
            received.append(message.record["message"])

        async def main():
            logger.remove()
            logger.add(sink, format="{message}")
            for n in range(3):
                logger.info("record {}", n)
            await logger.complete()

        asyncio.run(main())
        print(" ".join(received))
    """)
    assert out.split() == ["record", "0", "record", "1", "record", "2"]


def test_without_a_running_loop_loguru_behaves_as_with_its_own_module():
    # enqueue=True needs a loop at add(); a record logged outside any loop is dropped, not an error.
    out = _python("""
        from shared.fence import loguru_asyncio
        assert loguru_asyncio.install()
        from loguru import logger
        received = []

        async def sink(message):
            received.append(message)

        logger.remove()
        try:
            logger.add(sink, enqueue=True)
        except ValueError as exc:
            print(type(exc.__cause__).__name__)
        logger.add(sink)
        logger.info("outside any loop")
        print(len(received))
    """)
    assert out.split() == ["RuntimeError", "0"]


@pytest.mark.parametrize("source", ["import asyncio\n\nget_running_loop = asyncio.get_running_loop\n", ""])
def test_another_loguru_keeps_its_own_module(tmp_path, source):
    package = tmp_path / "loguru"
    package.mkdir()
    (package / "__init__.py").write_text("from loguru import _asyncio_loop\n")
    (package / "_asyncio_loop.py").write_text(source)
    out = _python(f"""
        from shared.fence import loguru_asyncio
        print(loguru_asyncio.install())
        import loguru
        print(loguru._asyncio_loop.__file__ == {str(package / "_asyncio_loop.py")!r})
    """, PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]))
    assert out.split() == ["False", "True"]


def test_it_changes_nothing_once_loguru_is_imported():
    out = _python("""
        import loguru, sys
        from shared.fence import loguru_asyncio
        print(loguru_asyncio.install(), sys.modules["loguru._asyncio_loop"] is loguru._asyncio_loop,
              "asyncio" in sys.modules)
    """)
    assert out.split() == ["False", "True", "True"]
