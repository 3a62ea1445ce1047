from kvpilot.main import main

raise SystemExit(main())
