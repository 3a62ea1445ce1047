from kvpilot.cli.main import main

raise SystemExit(main())
