"""One build step beyond pyproject.toml: ship ``verispec-hook.pth`` at the top of site-packages, in wheels and in
editable installs alike, so that ``lm_eval --model verispec`` works with the stock ``lm_eval`` command (lm-eval has
no plug-in entry points; see ``src/_verispec_hook.py``)."""

from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build

PTH = "verispec-hook.pth"


class build_pth(Command):
    """Copy the .pth file into the wheel's root: ``build_lib`` for a wheel; for an editable install (setuptools'
    documented ``editable_mode``) the unpacked editable wheel, which is ``install``'s ``install_lib`` there."""

    description = "ship verispec-hook.pth"
    user_options: list = []

    def initialize_options(self) -> None:
        self.build_lib = None
        self.editable_mode = False

    def finalize_options(self) -> None:
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def _target(self) -> Path:
        if self.editable_mode:
            return Path(self.get_finalized_command("install").install_lib)
        return Path(self.build_lib)

    def run(self) -> None:
        target = self._target()
        target.mkdir(parents=True, exist_ok=True)
        (target / PTH).write_text(Path("src", PTH).read_text())

    def get_outputs(self) -> list[str]:
        return [str(self._target() / PTH)]

    def get_source_files(self) -> list[str]:
        return [str(Path("src", PTH))]


class build_with_pth(build):
    sub_commands = [*build.sub_commands, ("build_pth", None)]


setup(cmdclass={"build": build_with_pth, "build_pth": build_pth})
