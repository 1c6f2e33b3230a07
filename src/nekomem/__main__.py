from nekomem.cli import main

raise SystemExit(main())
