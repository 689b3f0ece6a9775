module bulldozer/launcher

go 1.22
