from preheat.cli import main

raise SystemExit(main())
