from rlbalance.cli import main

raise SystemExit(main())
