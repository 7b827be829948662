"""boto3 is imported only when an s3:// folder is used: local runs never pay for it or need it."""

import subprocess
import sys

from tests.conftest import pipe_env


def test_help_and_local_clean_do_not_import_boto3(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.txt").write_text("hello")
    code = (
        "import sys\n"
        "from pipeline.cli.app import main\n"
        f"sys.argv = ['pipe', 'clean', {str(tmp_path / 'raw')!r}, '-o', {str(tmp_path / 'out')!r}, '--workers', '1', '--json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore', 's3transfer')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=pipe_env(), capture_output=True)
    help_code = "import sys; from pipeline.cli.app import app; assert 'boto3' not in sys.modules and 'botocore' not in sys.modules"
    subprocess.run([sys.executable, "-c", help_code], check=True, env=pipe_env())
    assert (tmp_path / "out" / "manifest.parquet").exists()
