"""`python -m timewheel.cli`: the same as the `timewheel` command."""

from timewheel.cli.main import main

raise SystemExit(main())
